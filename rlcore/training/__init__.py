"""What the controller asks of the roles and of the training backends that build them: the roles
(``roles``), the specs a builder receives (``specs``), the backend contract (``backends``), and what every
backend follows in a pass (``micro_batching``, ``lr_schedule``)."""
