def test_clock_pins(db):
    from tests.conftest import pin_clock
    pin_clock(db, 1700000000)
    assert db.execute("SELECT alk.now()").fetchone()[0] == 1700000000
