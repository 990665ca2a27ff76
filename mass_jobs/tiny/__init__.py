"""The tiny model the project builds itself (`build`: the paper's architecture, random weights, a local
tokenizer and the family's template; `paper_layout`: the paper's checkpoint as published, in small, with
its FP8 reference), its synthetic tasks (`tasks`) and the opt-in warm-up that makes it
follow the harness (`warm`, `warm_check`)."""
