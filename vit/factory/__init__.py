"""Building models: `create_model` by name (fresh, or with timm's or a file's weights) and
`load_model` from a file or folder that records its architecture."""
