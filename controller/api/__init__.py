"""Pydantic v2 models of the objects Muster reads and writes at the API-server boundary."""
