"""Fragment stores behind one small interface: the local file system and cloud object stores."""
