"""Bundled configuration: the example model repository in ``models/``."""
