"""Self-checks of the suite: deliberately broken implementations that the properties must catch."""
