"""Tests of the example applications (examples/) and their benchmark."""
