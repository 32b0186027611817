"""Floor 0, what every floor above may use: atomic file writes (`files`), one writer per folder
or file (`locks`), the torchrun process group (`process_group`), figures (`plots`), the
accepted ranges of numbers (`ranges`) and an error's message as one line (`messages`)."""
