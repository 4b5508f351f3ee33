"""cramkit.text"""
