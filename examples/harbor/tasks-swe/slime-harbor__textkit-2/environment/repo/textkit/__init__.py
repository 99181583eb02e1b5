"""Small text utilities."""
