"""The hot read path: framework-free answers for the reads clients poll, their cache and
read threads.
"""
