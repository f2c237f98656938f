"""The stand-in's own machinery (not an upstream module): the executor thread and generation."""
