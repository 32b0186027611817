"""Floor 0, what every floor above may use: atomic file writes (`files`), one writer per folder
or file (`locks`), the torchrun process group (`process_group`), figures (`plots`) and the
accepted ranges of numbers (`ranges`)."""
