"""MiniWoB++: the live environment in Chromium and the import of recorded human demonstrations."""
