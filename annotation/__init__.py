"""Labels: the automatic progress labels (``progress``: ProgRM's LCS self-annotation and the
environment milestones) and the human step labels of Label Studio (``labelstudio``)."""
