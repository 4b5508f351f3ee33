"""cramkit.train"""
