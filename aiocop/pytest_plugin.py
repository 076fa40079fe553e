"""pytest plugin (placeholder while it is being written; registered through `pytest11`)."""
