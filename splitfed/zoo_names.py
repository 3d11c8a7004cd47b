"""The zoo's model names, for a command line that refuses a bad ``--model`` before it imports torch
(:mod:`splitfed.models.zoo`, which holds the models, imports it). ``tests/test_benchmark_input.py`` holds this
list to the zoo's."""

ZOO_NAMES = ("cnn", "mlp", "mobilenetv2", "resnet18", "transformer", "vgg11")


def unknown_model_message(name: str) -> str:
    """Why ``name`` is no model ("" if it may be one): a name with no ':' that is not the zoo's (a
    ``module.path:factory`` is checked where it is imported). The zoo's own refusal
    (:func:`splitfed.models.zoo.resolve_spec`) says the same: tests/test_model_refused_early.py holds them alike."""
    if name in ZOO_NAMES or ":" in name:
        return ""
    return f"unknown model {name!r}: use one of {', '.join(sorted(ZOO_NAMES))} or 'module.path:factory'"
