"""cramkit.tasks"""
