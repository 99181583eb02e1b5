#!/bin/bash
set -e
# reverse=True also reversed the name order; negate the score instead.
cat > /app/leaderboard.py <<'PY'
def rank(players):
    """Order (name, score) tuples for the leaderboard.

    Highest score first; equal scores are ordered by name, A to Z.
    """
    return sorted(players, key=lambda player: (-player[1], player[0]))
PY
