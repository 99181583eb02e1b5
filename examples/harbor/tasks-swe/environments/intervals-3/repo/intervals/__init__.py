"""Interval arithmetic."""
