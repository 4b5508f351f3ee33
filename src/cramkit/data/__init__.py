"""cramkit.data"""
