"""packgen"""
