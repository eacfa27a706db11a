"""verl's side of the learning runs (``learning_runs.py``): GSM8K scored by verl's own
``verl.utils.reward_score.gsm8k`` with ``format_score=0.1``, what rlcore's ``reward.format_score = 0.1``
gives (1.0 right, 0.1 a wrong ``#### number``, 0 none), and the same two extras rlcore's GSM8K reward
reports, so that both systems' validation logs carry accuracy and format rate under the same names.

verl loads it by path: ``reward.custom_reward_function.path=<this file>
reward.custom_reward_function.name=compute_score``.
"""

from verl.utils.reward_score import gsm8k

FORMAT_SCORE = 0.1


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    answer = gsm8k.extract_solution(solution_str, method="strict")
    return {"score": float(gsm8k.compute_score(solution_str, ground_truth, method="strict",
                                               format_score=FORMAT_SCORE, score=1.0)),
            "acc": float(answer is not None and answer == ground_truth),
            "format": float(answer is not None)}
