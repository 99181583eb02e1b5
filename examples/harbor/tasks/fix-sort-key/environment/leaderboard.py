def rank(players):
    """Order (name, score) tuples for the leaderboard.

    Highest score first; equal scores are ordered by name, A to Z.
    """
    return sorted(players, key=lambda player: (player[1], player[0]), reverse=True)
