"""Data: preprocessors writing verl-schema parquet (``rlcore data NAME``) and the prompt dataset and loader.

verl's schema, one row per prompt::

    data_source   str                     picks the reward function ("openai/gsm8k")
    prompt        list of {role, content} chat messages
    ability       str                     ("math")
    reward_model  {style, ground_truth}   ground_truth is what the reward function compares with
    extra_info    {split, index, ...}     passed to the reward function as is
"""
