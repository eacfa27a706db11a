"""A verl-style reward: how close a response's length in words is to a target."""


def compute_length_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """1.0 at exactly ``ground_truth`` words, falling linearly to 0 at twice (or zero) that length."""
    target = int(ground_truth)
    words = len(solution_str.split())
    if target <= 0:
        return 1.0 if words == 0 else 0.0
    return max(0.0, 1.0 - abs(words - target) / target)
