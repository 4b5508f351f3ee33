"""cramkit.model"""
