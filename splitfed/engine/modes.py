"""The variants of split learning the engine runs (torch-free: the command line offers them as choices)."""

MODES = ("sl", "sflv1", "sflv2")
IN_TURN = ("sl", "sflv2")  # the variants whose clients train one after another (SplitRound: a group each)
