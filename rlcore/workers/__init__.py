"""Ray worker groups: one hybrid worker process per device hosting the colocated roles."""
