"""Attribution graphs: which features drove a logit, computed on the served model and checked on it."""
