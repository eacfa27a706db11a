"""Models: where they come from and how they load (``loading``), and a mixture of experts' routing
recorded and replayed (``routing``)."""
