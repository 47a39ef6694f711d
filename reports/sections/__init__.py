"""One module per report section; each returns a `reports.markdown.Section`."""
