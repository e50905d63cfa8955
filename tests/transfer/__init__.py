"""Tests of export, import, archive, saved histories."""
