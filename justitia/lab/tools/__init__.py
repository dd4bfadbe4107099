"""Tools for results: the README's table, comparing two results documents, and shipping the compact
data files.
"""
