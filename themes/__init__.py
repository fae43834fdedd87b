"""The console's themes: one YAML file per theme in this folder, whose keys are textual.theme.Theme's fields.

Add a theme by dropping a `*.yaml` file here (see dark.yaml for the keys). The folder sits at the top of the
repository so it is easy to find; it ships inside the console as the data package `libreyolo_console.themes`
(pyproject.toml maps it), which `libreyolo_console.theming.load_themes` reads."""
