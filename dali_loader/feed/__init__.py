"""The feed: order, read-ahead and byte checks between storage and a decoder.

`epochs.Feed` (a recipe) hands out independent `FeedEpoch`s; `items` decides
what an item is for each decoder; `checks` looks at bytes before DALI sees
them; `readahead` keeps many reads in flight; `policy` is the `on_error` handler.
"""
