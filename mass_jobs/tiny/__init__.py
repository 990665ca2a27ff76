"""The tiny model the project builds itself (`build`: the paper's architecture, random weights, a local
tokenizer and the family's template), its synthetic tasks (`tasks`) and the opt-in warm-up that makes it
follow the harness (`warm`, `warm_check`)."""
