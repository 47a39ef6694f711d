"""One module per report section; each returns a `reports.markdown.Section`."""


def model_label(model: str) -> str:
    """A result's model as a figure title or a sentence names it: its name, without what follows in parentheses
    (the file it was read from, a path on the machine that ran it)."""
    return model.split(" (")[0]
