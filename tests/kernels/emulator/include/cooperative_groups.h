namespace cooperative_groups {}
