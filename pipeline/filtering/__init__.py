"""The engine of the filter stage (only it loads this folder).

lengths  example lengths (pre-tokens or characters), counted in worker processes, and their
         percentiles from a histogram, so no pass holds the lengths of the whole corpus
tables   the stage's rows as Arrow tables: reading raw/ batch by batch, writing row groups, and
         putting train in the shuffled carve's order, spilled to bucket files
"""
