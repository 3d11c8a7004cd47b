"""The zoo's model names, for a command line that refuses a bad ``--model`` before it imports torch
(:mod:`splitfed.models.zoo`, which holds the models, imports it). ``tests/test_benchmark_input.py`` holds this
list to the zoo's."""

ZOO_NAMES = ("cnn", "mlp", "mobilenetv2", "resnet18", "transformer", "vgg11")
