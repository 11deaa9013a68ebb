"""`wattwise calibrate`: every profile's TPs, which of them are extrapolated, and the defaults."""

from wattwise.cli import main


def test_calibrate_names_each_profiles_tps_and_the_pairs_it_is_default_for(capsys) -> None:
    assert main(["calibrate"]) == 0
    rows = {line.split()[0]: line.split()[2:] for line in capsys.readouterr().out.splitlines()[2:8]}
    assert rows["mlenergy-llama3-70b-h100"] == ["2*", "4", "8*", "llama3.1-70b,", "llama2-70b"]
    assert rows["splitwise-llama2-70b-h100"] == ["2", "4", "8", "-"]  # no longer the default, still by name
    assert rows["splitwise-llama2-70b-a100"][-1] == "llama2-70b"  # no current-stack profile covers A100
