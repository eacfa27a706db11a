"""What the core needs of the machine it runs on: its devices (``platforms``), the process group of a
training backend (``distributed``), supervised worker processes (``supervised_pool``), signals that stop a
job (``stopping``) and files that appear only when complete (``atomic``)."""
