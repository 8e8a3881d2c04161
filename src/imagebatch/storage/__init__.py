"""The output location behind one seam (a local folder or an object store) and the names of its files."""
