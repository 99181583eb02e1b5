"""What the test modules share, one module per concept (fixtures live in tests/conftest.py).

A test module imports from here, never from another test module (tests/test_layout.py checks)."""
