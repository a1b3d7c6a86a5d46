"""``tune``: candidates, selection and the run that measures them."""
