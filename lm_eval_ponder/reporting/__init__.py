"""Stage 5 of the data path: from lm-eval sample logs to a leaderboard.

``suite`` (runs every method x dataset through the real ``lm_eval`` CLI, resumably) and
``report`` (tables, Pareto and per-level plots, statistics).
"""
