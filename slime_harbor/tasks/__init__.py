"""Task sources: code that writes Harbor task dirs.

    families.py     procedural task families with disjoint train / held-out splits
"""
