"""The denoiser benchmark never trains on a text the shipped attack table attacks."""

from benchmarks.bench_channel_denoiser import drop_attacked


def test_long_attacked_texts_are_left_out_whatever_the_cut():
    long_text = list(range(100, 160))  # 60 tokens: longer than both cuts
    short_text = [5, 6, 7]
    other = list(range(200, 260))
    attacked = [long_text[:48], short_text]  # the table cuts its texts to 48 tokens
    kept = drop_attacked([long_text, short_text, other, long_text[:40]], attacked, 48)
    assert kept == [other, long_text[:40]]  # a shorter text that is a prefix is another text
    # Cut to the denoiser's 46 tokens first, the long text would no longer match: the bug this
    # guards against.
    assert long_text[:46] in drop_attacked([r[:46] for r in [long_text]], attacked, 48)
