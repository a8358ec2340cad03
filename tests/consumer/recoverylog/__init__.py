"""Tests of recovery logs: FSM, segments, recorder and player."""
