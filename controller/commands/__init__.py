"""``muster`` sub-commands, one module each (registered in ``controller.cli``)."""
