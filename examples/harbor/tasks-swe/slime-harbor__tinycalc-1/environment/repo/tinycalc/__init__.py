"""Tiny calculator helpers."""
