"""Entry points for other trainers' frameworks (verifiers / prime-rl)."""
