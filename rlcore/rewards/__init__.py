"""Rewards: rule scorers keyed by a sample's ``data_source``, user functions loaded from a file, and
``RewardScorer``, which picks one per sample and turns what it returns into a score tensor.

Every scorer has verl's signature ``compute_score(data_source, solution_str, ground_truth,
extra_info=None, **kwargs)`` and returns a number or a dict with a numeric ``"score"``.
"""
