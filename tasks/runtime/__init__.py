"""What every room needs while it runs: the dependencies' warnings and logs kept quiet (``quiet``) and one line
printed once per job (``rank_zero``)."""
