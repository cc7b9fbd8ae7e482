"""Sharing policy, pure: fair share over the bank tree (fairshare.py) and multifactor priority (priority.py)."""
