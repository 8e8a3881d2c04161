"""Delivery: the approved images exported under the names a shop wants, and results as DataFrames."""
