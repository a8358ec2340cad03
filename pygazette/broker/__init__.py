"""The broker: serves the Journal service over journals assigned to this process."""
